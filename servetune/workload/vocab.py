"""The fixed vocabulary prompts are drawn from.

Common English words, so character-to-token ratios resemble real prose under any tokenizer.
Changing this list changes every generated prompt: bump ``GENERATOR_VERSION`` in generator.py.
"""

from __future__ import annotations

_TEXT = """
the of and to in is was for on that with as by at from his her an be this which or had are not
but were have one they their all been has more when who will would there can about into other
time after first some also two only new them these its made over such may then could any most
like through where over back years just before much between each many people during both under
well same state work year great three world since should while city must during part place case
point group number world school house system program question government company night water
room mother area money story fact month lot right study book eye job word business issue side
kind head service friend father power hour game line end member law car name president team
minute idea kid body information back parent face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force education
foot boy age policy everything process music market sense nation plan college interest death
experience effect use class control care field development role effort rate heart drug show
leader light voice wife police mind price report decision son view relationship town road arm
difference value building action model season society tax director position player record paper
space ground form event official matter center couple site project activity star table need court
oil situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer type
attention film tree source organization hair window evidence population truth song land river
garden bridge mountain ocean forest island valley desert village harbor castle tower station
market window kitchen library museum theater stadium airport factory farm hospital church temple
bright quiet simple early large small young old long short high low strong weak warm cold green
blue red yellow white black brown gray golden silver happy calm clear deep easy fair fresh full
gentle kind late light loud new open plain proud quick rare rich safe sharp slow soft solid sweet
tall thin tired true wide wild wise yellow careful certain common correct curious different
final formal general honest human local major modern natural normal public rapid recent regular
serious similar special strange sudden useful usual various vast visible vital willing ancient
build carry catch choose climb close cover cross draw drive eat fall feel fill find fly follow
give grow hear help hold join jump keep know learn leave lift listen live look make measure meet
move open paint pass pay plant play pull push reach read remember repeat rest return ride rise
run save say see sell send share sing sit sleep speak stand start stay stop study swim take talk
teach tell think throw touch travel try turn walk wash watch wear win wonder write answer arrive
begin believe borrow breathe bring collect compare consider continue create decide describe
discover explain gather guess imagine improve include invite notice offer prepare promise
protect provide receive reduce remain replace report require respond select serve settle solve
suggest support suppose survive wander whisper
apple bread butter cheese coffee honey lemon orange pepper rice salt sugar tea tomato grape
bicycle boat bus train truck wagon rocket engine wheel anchor compass lantern ladder hammer
needle pencil basket blanket bottle bucket button candle carpet chair clock curtain envelope
feather glove helmet jacket kettle ladder mirror pillow ribbon rope scarf shovel spoon thread
umbrella violin whistle marble copper iron stone glass wood cotton wool silk leather paper
cloud rain snow storm thunder wind sunrise sunset shadow season summer winter autumn spring
morning evening midnight moment century decade history journey lesson memory message mystery
pattern puzzle question signal silence sound spirit surface theory thought treasure victory
animal bird cat dog fish horse lion mouse rabbit sheep tiger whale wolf eagle owl bee ant
"""

WORDS: tuple[str, ...] = tuple(dict.fromkeys(_TEXT.split()))
